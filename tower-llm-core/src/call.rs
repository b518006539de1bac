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
//! The layers write it through [`layer`](crate::layer), where the
//! cross-layer contract is written.
//!
//! Each value in the carrier is read and stored through the request
//! (`Deadline::of(&req)`, `Link::store(link, &mut req)`, ...): those
//! accessors are here too, so the files of the values need not know the
//! carrier.
//!
//! [`ChatRequest`]: crate::ChatRequest
//! [`EmbeddingRequest`]: crate::EmbeddingRequest

use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap};

use crate::{AttemptLog, Budget, Deadline, KeepAttempts, Link, NotReplayable, Tenant};

/// Everything one logical call carries between the layers: the deadline,
/// the link being tried, the attempt number, the shared attempt log, and
/// (when set) the idempotency key, the cost [`Budget`](crate::Budget) and
/// the [`Tenant`](crate::Tenant).
/// Cloning it clones reference counts only.
///
/// Every request type reaches it through one trait, [`LlmRequest`]:
/// [`ChatRequest`](crate::ChatRequest) and [`EmbeddingRequest`](crate::EmbeddingRequest) carry it as a field (`call`),
/// so a copy of the request clones a few reference counts and nothing
/// else (their prompt is shared too); [`http::Request`] carries it in one
/// slot of its [`http::Extensions`].
///
/// Read it here; the layers write it through
/// [`layer::CallExt`](crate::layer::CallExt), by the cross-layer contract
/// written in the [`layer`](crate::layer#the-cross-layer-contract) module
/// (one owner, one deadline, who is called, attempt numbers, who writes a
/// record, copies for later, hedges).
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
    pub(crate) deadline: Option<Deadline>,
    pub(crate) log: Option<AttemptLog>,
    pub(crate) link: Option<Link>,
    /// The number of the attempt this copy is for (0: unset, read as 1).
    pub(crate) attempt: u8,
    /// This copy is a hedge (rule 7).
    pub(crate) hedge: bool,
    /// The values few calls carry (idempotency key, budget, tenant),
    /// behind one pointer so the carrier stays small: every layer moves
    /// and copies it.
    pub(crate) extras: Option<Arc<Extras>>,
}

/// The carrier's rarer values.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    /// The caller's idempotency key, if any.
    idempotency: Option<IdempotencyKey>,
    /// What the call may spend, if it is held to a budget.
    budget: Option<Budget>,
    /// Who the call is for, as far as quotas go.
    tenant: Option<Tenant>,
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
        req.call()?.extras()?.idempotency.as_ref()
    }

    /// Stores this key in `req`'s call.
    pub fn store<R: LlmRequest + ?Sized>(self, req: &mut R) {
        req.call_mut().extras_mut().idempotency = Some(self);
    }
}

impl Call {
    fn extras(&self) -> Option<&Extras> {
        self.extras.as_deref()
    }

    /// The rarer values, to change (copied first if a request copy shares
    /// them).
    fn extras_mut(&mut self) -> &mut Extras {
        Arc::make_mut(self.extras.get_or_insert_default())
    }

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

    /// Stores `deadline`, keeping an earlier one already there; returns the
    /// deadline in force (rule 2).
    pub(crate) fn put_deadline(&mut self, deadline: Deadline) -> Deadline {
        let in_force = match self.deadline {
            Some(existing) if existing < deadline => existing,
            _ => deadline,
        };
        self.deadline = Some(in_force);
        in_force
    }

    /// Installs a fresh attempt log unless the call has one: the log if
    /// this call created it (rule 1).
    pub(crate) fn install_fresh_log(&mut self) -> Option<AttemptLog> {
        if self.log.is_some() {
            return None;
        }
        let log = AttemptLog::new();
        self.log = Some(log.clone());
        Some(log)
    }
}

/// A request tower-llm's layers can work on: it carries a [`Call`].
///
/// Implemented for [`ChatRequest`](crate::ChatRequest) and [`EmbeddingRequest`](crate::EmbeddingRequest) (a field) and
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
    /// call (see [`Replay`](crate::layer::Replay)). The default takes the call out for the moment
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
        extensions.len() > ours && extensions.get::<KeepAttempts>().is_some()
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
        impl $crate::LlmRequest for $request {
            fn call(&self) -> Option<&$crate::Call> {
                self.call.as_ref()
            }

            fn call_mut(&mut self) -> &mut $crate::Call {
                self.call.get_or_insert_default()
            }

            fn take_call(&mut self) -> Option<$crate::Call> {
                self.call.take()
            }

            fn is_replayable(&self) -> bool {
                self.extensions.is_empty()
                    || self.extensions.get::<$crate::NotReplayable>().is_none()
            }
        }
    };
}

pub(crate) use call_field;

/// Each value that travels in the carrier, read and stored through the
/// request: `Deadline::of(&req)`, `Link::store(link, &mut req)`, ...
impl Deadline {
    /// The deadline of the call `req` carries, if any.
    pub fn of<R: LlmRequest + ?Sized>(req: &R) -> Option<Self> {
        req.call().and_then(Call::deadline)
    }

    /// The time left of the deadline of the call `req` carries, if any.
    pub fn remaining_in<R: LlmRequest + ?Sized>(req: &R) -> Option<Duration> {
        Deadline::of(req).map(Deadline::remaining)
    }

    /// Stores this deadline in the call `req` carries, keeping an earlier
    /// one that is already there. Returns the deadline now in force.
    pub fn store<R: LlmRequest + ?Sized>(self, req: &mut R) -> Deadline {
        req.call_mut().put_deadline(self)
    }
}

impl Link {
    /// The link stored in the call `req` carries, if any.
    pub fn of<R: LlmRequest + ?Sized>(req: &R) -> Option<&Link> {
        req.call().and_then(Call::link)
    }

    /// Stores this link in the call `req` carries (replacing one stored
    /// before).
    pub fn store<R: LlmRequest + ?Sized>(self, req: &mut R) {
        req.call_mut().link = Some(self);
    }
}

impl Budget {
    /// The budget of the call `req` carries, if any.
    pub fn of<R: LlmRequest + ?Sized>(req: &R) -> Option<&Budget> {
        req.call()?.extras()?.budget.as_ref()
    }

    /// Stores this budget in the call `req` carries, unless the call has
    /// one with a lower (or the same) limit: the lower limit stays in
    /// force (a caller may lower a route's budget, never raise it).
    /// Returns the budget in force.
    pub fn store<R: LlmRequest + ?Sized>(self, req: &mut R) -> Budget {
        if let Some(existing) = Budget::of(req) {
            if existing.limit() <= self.limit() {
                return existing.clone();
            }
        }
        req.call_mut().extras_mut().budget = Some(self.clone());
        self
    }
}

impl Tenant {
    /// The tenant of the call `req` carries, if any.
    pub fn of<R: LlmRequest + ?Sized>(req: &R) -> Option<&Tenant> {
        req.call()?.extras()?.tenant.as_ref()
    }

    /// Stores this tenant in the call `req` carries.
    pub fn store<R: LlmRequest + ?Sized>(self, req: &mut R) {
        req.call_mut().extras_mut().tenant = Some(self);
    }
}

impl AttemptLog {
    /// The log of the call `req` carries, if any.
    pub fn of<R: LlmRequest + ?Sized>(req: &R) -> Option<&AttemptLog> {
        req.call().and_then(Call::log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatRequest, Message};

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
}
