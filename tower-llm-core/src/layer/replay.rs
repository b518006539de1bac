//! [`Replay`]: a request copy kept to send later.

use super::owner::CallOwner;
use crate::telemetry::Metrics;
use crate::{Call, LlmRequest};

/// A request copy kept to send later (the retry layer's next attempt, the
/// fallback layer's next link; rule 6 of the
/// [contract](super#the-cross-layer-contract)): the
/// request without its carrier, and the carrier beside it, put back when
/// the copy is sent. On the success path the copy is never sent, so keeping
/// it costs the request's own clone (reference counts for a
/// [`ChatRequest`](crate::ChatRequest)) and nothing for the carrier.
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
    use crate::layer::{AttemptLogExt as _, CallExt as _};
    use crate::{
        AttemptLog, AttemptOutcome, AttemptRecord, ChatRequest, Deadline, Link, Message,
        NotReplayable,
    };

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
